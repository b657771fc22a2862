from fastlimit.server.main import main

main()
