import sys

from oxrl.cli import main

sys.exit(main())
