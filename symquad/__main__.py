import sys

from symquad.cli import main

sys.exit(main())
