"""`python -m testbed.traffic WORKLOAD ...`: see testbed.traffic.workloads."""

import sys

from testbed.traffic.workloads import main

sys.exit(main())
