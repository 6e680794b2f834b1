"""NumPy printers for generated kernels.

:class:`BatchedMatrixPrinter` prints matrix expressions so that every operand
may carry leading batch dimensions: products use ``@``, transposes swap the
last two axes, and scalars built from traces keep two trailing singleton axes
(shape ``(..., 1, 1)``) so that they broadcast against matrices.  Traces
never reach it: the matrix renderer replaces them by scalar symbols first.
"""

from __future__ import annotations

import sympy as sp
from sympy.printing.numpy import NumPyPrinter

__all__ = ["BatchedMatrixPrinter", "ScalarPrinter"]


class ScalarPrinter(NumPyPrinter):
    """NumPy printer for scalar (entry-by-entry) expressions; plain ``numpy`` prefix."""

    def __init__(self, settings=None):
        super().__init__({"fully_qualified_modules": True, "strict": True, **(settings or {})})

    def _print_Pow(self, expr, rational=False):
        # Integer powers as repeated products are exact and faster than ``**``
        # for small exponents; keep ``**`` otherwise.
        base, exp = expr.as_base_exp()
        if exp.is_Integer and 2 <= exp <= 4:
            b = self.parenthesize(base, sp.printing.precedence.PRECEDENCE["Mul"] + 1)
            return "(" + "*".join([b] * int(exp)) + ")"
        if exp.is_Integer and -4 <= exp <= -1:
            b = self.parenthesize(base, sp.printing.precedence.PRECEDENCE["Mul"] + 1)
            return "1/(" + "*".join([b] * int(-exp)) + ")"
        return super()._print_Pow(expr, rational=rational)

    def _print_Rational(self, expr):
        return f"{expr.p}/{expr.q}"


class BatchedMatrixPrinter(ScalarPrinter):
    """Printer for matrix expressions in ``Q, rho, T`` with batch support."""

    def _print_MatrixSymbol(self, expr):
        return expr.name

    def _print_Transpose(self, expr):
        return f"numpy.swapaxes({self._print(expr.arg)}, -1, -2)"

    def _print_Trace(self, expr):
        # the matrix renderer replaces traces by scalar symbols computed once
        # (render._trace_symbols); a trace reaching the printer is a bug
        raise NotImplementedError(f"trace {expr} must be replaced by a symbol before printing")

    def _print_MatMul(self, expr):
        scalars = [a for a in expr.args if not isinstance(a, sp.MatrixExpr)]
        mats = [self._print(a) if not isinstance(a, (sp.MatAdd,)) else f"({self._print(a)})"
                for a in expr.args if isinstance(a, sp.MatrixExpr)]
        product = " @ ".join(mats)
        if not scalars:
            return product
        coeff = sp.Mul(*scalars)
        return f"({self._print(coeff)})*({product})" if len(mats) > 1 else \
            f"({self._print(coeff)})*{product}"

    def _print_MatAdd(self, expr):
        return " + ".join(self._print(a) for a in expr.args)

    def _print_MatPow(self, expr):
        if expr.exp.is_Integer and expr.exp >= 1:
            return " @ ".join([self._print(expr.base)] * int(expr.exp))
        raise NotImplementedError(f"matrix power {expr}")

    def _print_ZeroMatrix(self, expr):  # pragma: no cover - not produced for our models
        raise NotImplementedError("zero matrix in a kernel")
