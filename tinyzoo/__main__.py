import sys
from tinyzoo.cli import main

sys.exit(main())
