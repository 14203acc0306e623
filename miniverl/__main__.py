from miniverl.cli import entry

entry()
