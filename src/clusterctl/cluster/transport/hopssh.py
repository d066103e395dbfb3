"""How a node's own OpenSSH client logs in to another node (tree and push relay hops).

One job: the client options both hop scripts share that are about cost, not trust
(trust is theirs: strict host keys from this machine's known_hosts, the one-use agent
or ``node_identity_file``).

:data:`HOP_KEX`: OpenSSH 9.0 to 9.8 put ``sntrup761x25519-sha512`` first in the
client's key exchange proposal, and it is the costly part of a login: measured on the
sandbox (OpenSSH 9.2p1, two batches of 20 logins each way, alternated), a node-to-node
login took 119 to 127 ms of the machine's CPU (client and the child's sshd together) and
209 to 221 ms of wall with it, against 42 to 44 ms and 137 to 139 ms without it
(``curve25519-sha256`` negotiated): about 80 ms of CPU saved per login.  A tree logs in
to every node once per pass (launch makes two): it was about half of what the tree added
to each node's work.

The option REMOVES only sntrup761 from the client's default list, so each node keeps the
rest of its own defaults in its own order: OpenSSH 9.9 and later still lead with
``mlkem768x25519-sha256`` (post-quantum and cheap), older ones fall to
``curve25519-sha256``, which is what this machine's own connections to the nodes use
(paramiko offers no post-quantum exchange), so a hop's traffic is never protected by
less than the connection that carried its request.  A client older than OpenSSH 7.5
(2017), which cannot read a ``-`` list, fails the hop, and the node gets its own
connection, as every failed hop does.
"""

from __future__ import annotations

#: ``ssh -o KexAlgorithms=...`` for every hop: the defaults without sntrup761 (see above).
HOP_KEX = "-sntrup761x25519-sha512@openssh.com,sntrup761x25519-sha512"
