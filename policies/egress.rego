# sandgate egress policy: decides every connection a sandbox attempts through sandgate's proxy.
#
# The proxy asks for `decision` before it resolves the name or dials anything, and obeys it: a
# denied name is never even looked up. Address checks (loopback, metadata, private ranges) and
# the TLS SNI check happen in the proxy after an allow; this policy decides on the name and port.
#
# Input (built by the proxy for each connection; README.md shows a complete example):
#   input.execution   the execution the connection belongs to, known from the socket it came on:
#                     id, tenant, grant (the `network` its execution decision granted:
#                     {allow: [{host, ports}], max_connections, max_bytes})
#   input.connection  what the sandbox asks to reach: host, port, scheme (`https`: CONNECT to a
#                     TLS port; `connect`: CONNECT to another port; `http`: plain HTTP), and for
#                     plain HTTP only: method, path
#
# `input.connection.host` is canonical before it gets here (lower case, no trailing dot, IDNA,
# dotted-quad IPv4), so comparing strings is enough. Grant patterns were checked when the
# execution was decided: no `*`, no `*.com`, no upper case, no port 0.
#
# Output: {"allow": bool, "reasons": [{code, message}]}. Anything else (an unknown field, an
# undefined decision, an error) denies the connection with `policy.error`.

package sandgate.egress

# The grant's rules for this connection's host. A rule matches when its pattern is the host
# itself, or when it is `*.<name>` and the host ends in `.<name>`: `*.example.com` matches
# `a.example.com` and `a.b.example.com`, but not `example.com` and not `badexample.com` (the
# match is on a label boundary).
matching contains rule if {
	some rule in input.execution.grant.allow
	rule.host == input.connection.host
}

matching contains rule if {
	some rule in input.execution.grant.allow
	startswith(rule.host, "*.")
	endswith(input.connection.host, trim_prefix(rule.host, "*"))
	# A canonical host never starts with a dot; should one slip through, `.example.com` (an
	# empty label) must not pass for a name below `example.com`.
	not startswith(input.connection.host, ".")
}

# Allowed: some matching rule lists the port.
decision := {"allow": true, "reasons": []} if port_granted

# egress.host_not_granted: no rule of the grant matches the host.
decision := {"allow": false, "reasons": [{"code": "egress.host_not_granted", "message": msg}]} if {
	matching == set()
	msg := sprintf("%s is not granted to execution %s", [input.connection.host, input.execution.id])
}

# egress.port_not_granted: the host is granted, but not on this port.
decision := {"allow": false, "reasons": [{"code": "egress.port_not_granted", "message": msg}]} if {
	matching != set()
	not port_granted
	ports := sort({port | some rule in matching; some port in rule.ports})
	msg := sprintf(
		"%s is granted to execution %s on ports %v, not %d",
		[input.connection.host, input.execution.id, ports, input.connection.port],
	)
}

port_granted if {
	some rule in matching
	input.connection.port in rule.ports
}
