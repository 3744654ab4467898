from kernels.cli import main

raise SystemExit(main())
