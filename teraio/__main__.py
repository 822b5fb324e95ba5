from teraio.cli import main

main()
