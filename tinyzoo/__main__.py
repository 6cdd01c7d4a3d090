import sys
from tinyzoo import main

sys.exit(main())
