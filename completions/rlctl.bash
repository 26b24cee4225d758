# rlctl bash completion: generated from the CLI by completions/generate.py; do not edit.
_rlctl_completion() {
    local IFS=$'\n'
    COMPREPLY=( $( env COMP_WORDS="${COMP_WORDS[*]}" \
                   COMP_CWORD=$COMP_CWORD \
                   _RLCTL_COMPLETE=complete_bash $1 ) )
    return 0
}

complete -o default -F _rlctl_completion rlctl
