# rlctl fish completion: generated from the CLI by completions/generate.py; do not edit.
complete --command rlctl --no-files --arguments "(env _RLCTL_COMPLETE=complete_fish _TYPER_COMPLETE_FISH_ACTION=get-args _TYPER_COMPLETE_ARGS=(commandline -cp) rlctl)" --condition "env _RLCTL_COMPLETE=complete_fish _TYPER_COMPLETE_FISH_ACTION=is-args _TYPER_COMPLETE_ARGS=(commandline -cp) rlctl"
