"""What the commands write and print for people: the precheck's files, HTML pages, terminal tables."""
