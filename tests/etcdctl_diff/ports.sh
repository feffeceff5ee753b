# Sourced by the etcdctl scripts: free_port prints a loopback port nobody listens on and that
# this script has not handed out before. Ports come from below the kernel's ephemeral range
# (32768+): an outgoing connection of a running member could otherwise take the port before
# the member that was given it binds.
USED=" "
free_port() {
    local p
    while :; do
        p=$((12000 + RANDOM % 20000))
        [[ $USED == *" $p "* ]] && continue
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            USED+="$p "
            echo "$p"
            return
        fi
    done
}
