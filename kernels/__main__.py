from kernels.cli import main, stop_on_sigterm

stop_on_sigterm()
raise SystemExit(main())
