"""`python -m sdar_envs.server`: serve one family (see sdar_envs.server.process.main)."""

import sys

from sdar_envs.server.process import main

sys.exit(main())
