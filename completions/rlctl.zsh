#compdef rlctl
# rlctl zsh completion: generated from the CLI by completions/generate.py; do not edit.

_rlctl_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _RLCTL_COMPLETE=complete_zsh rlctl)
}

compdef _rlctl_completion rlctl
