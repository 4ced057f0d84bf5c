from strom.cli.main import main

main()
