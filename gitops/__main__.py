from gitops.cli import main

main()
