from patchkit.cli import run

run()
