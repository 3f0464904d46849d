from mjoin.cli import main

raise SystemExit(main())
