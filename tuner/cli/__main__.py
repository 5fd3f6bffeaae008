from .common import main

main()
