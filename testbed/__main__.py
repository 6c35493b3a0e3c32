import sys

from testbed.main import main

sys.exit(main())
