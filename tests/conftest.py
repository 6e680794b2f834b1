import pytest


def random_overlaps(p, p_star, rng, scale=1.0):
    """A random positive-definite point (Q, rho, T): the Gram matrix of random weights / N."""
    n = p + p_star
    G = rng.standard_normal((n, n + 3))
    C = scale * G @ G.T / (n + 3)
    return C[:p, :p].copy(), C[:p, p:].copy(), C[p:, p:].copy()


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """Point the kernel cache at a fresh directory."""
    monkeypatch.setenv("SYMQUAD_CACHE_DIR", str(tmp_path / "kernel-cache"))
    return tmp_path / "kernel-cache"
