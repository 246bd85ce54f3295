from draftnas.cli import main

main()
