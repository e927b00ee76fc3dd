from loadertop.cli import main

raise SystemExit(main())
