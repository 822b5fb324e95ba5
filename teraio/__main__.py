from teraio.app.cli import main

main()
