import sys

from specdiff.cli import main

sys.exit(main())
