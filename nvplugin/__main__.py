from nvplugin.cli import main

main()
