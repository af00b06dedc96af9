import sys

from hetero.cli import main

sys.exit(main())
