from byok.cli import main

raise SystemExit(main())
