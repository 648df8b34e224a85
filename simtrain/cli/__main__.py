"""``python -m simtrain.cli``."""

from simtrain.cli.main import main

raise SystemExit(main())
