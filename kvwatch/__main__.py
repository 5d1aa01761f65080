from kvwatch.cli import main

raise SystemExit(main())
