from qcompiler.cli import main

main(prog_name="qcompiler")
