import sys

from humanline.cli import main

sys.exit(main())
