"""python -m fastln.serve: the server's command line (fastln-serve)."""
import sys

from . import main

sys.exit(main())
