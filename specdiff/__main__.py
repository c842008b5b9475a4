import sys

from specdiff.cli import main

# guarded: a worker process started with `spawn` imports this module again as __mp_main__
if __name__ == "__main__":
    sys.exit(main())
