import sys

from thunder_core.cli import main

sys.exit(main())
