from fitbox.cli import main

raise SystemExit(main())
