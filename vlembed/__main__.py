from vlembed.cli import main

raise SystemExit(main())
