from miniverl.cli import main

raise SystemExit(main())
