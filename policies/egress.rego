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
#                     plain HTTP: method, path; for a request inside an inspected tunnel (scheme
#                     `https` with a method): method, path, query, headers (names), and
#                     upgrade (the protocol an `Upgrade` header asks for, when there is one).
#                     `path` is normalised by the proxy (dot segments removed, unreserved
#                     escapes decoded, encoded `/` `\` NUL refused): it is exactly the path the
#                     upstream is sent, so a prefix compare cannot be walked around with `../`
#
# `input.connection.host` is canonical before it gets here (lower case, no trailing dot, IDNA,
# dotted-quad IPv4), so comparing strings is enough. Grant patterns were checked when the
# execution was decided: no `*`, no `*.com`, no upper case, no port 0.
#
# Output: {"allow": bool, "reasons": [{code, message}], "credentials": [names]?, "upgrade": bool?}.
# The proxy shows the sandbox the first reason's code (`sandgate-egress: <code>: <message>`).
# Anything else (an unknown field, an
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
decision := {"allow": true, "reasons": []} if {
	not is_request
	port_granted
}

# egress.host_not_granted: no rule of the grant matches the host.
decision := {"allow": false, "reasons": [{"code": "egress.host_not_granted", "message": msg}]} if {
	not is_request
	matching == set()
	msg := sprintf("%s is not granted to execution %s", [input.connection.host, input.execution.id])
}

# egress.port_not_granted: the host is granted, but not on this port.
decision := {"allow": false, "reasons": [{"code": "egress.port_not_granted", "message": msg}]} if {
	not is_request
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

# ---------------------------------------------------------------------------------------------
# Requests inside an inspected tunnel (grant rule with `inspect: true`, DESIGN section 11)
# ---------------------------------------------------------------------------------------------
#
# The tunnel itself was decided above (no `method`). The proxy then terminates TLS and asks again
# for every HTTP request in it, with `connection.method`, `.path` (no query), `.query` and
# `.headers` (names only). The rules are the tenant's `requests` on its allowlist entry for the
# host (policies/data/tenants.yaml):
#   requests: [{methods: [GET, HEAD], paths: ["/repos/"], credentials: [github]}]
# A request is allowed when some rule lists its method and one of the rule's path prefixes starts
# its path; the output's `credentials` are that rule's, which the proxy attaches (a name the
# grant does not list for the host is a `policy.error`). No rule, no request: fail closed.
# A request asking for an `Upgrade` (WebSocket) matches only a rule that lists the protocol in
# `upgrades` (`upgrades: [websocket]`); the output then says `"upgrade": true`, without which the
# proxy refuses the upgrade: after the upstream's `101` no later byte is decided.

is_request if {
	input.connection.scheme == "https"
	input.connection.method
}

tenant_requests contains r if {
	some rule in data.tenants[input.execution.tenant].network.allow
	rule.host == input.connection.host
	some r in object.get(rule, "requests", [])
}

path_matches contains r if {
	some r in tenant_requests
	input.connection.method in r.methods
	some prefix in r.paths
	startswith(input.connection.path, prefix)
}

request_matches contains r if {
	some r in path_matches
	upgrade_fits(r)
}

upgrade_fits(_) if not input.connection.upgrade

upgrade_fits(r) if input.connection.upgrade in object.get(r, "upgrades", [])

decision := object.union({"allow": true, "reasons": [], "credentials": sort(credentials)}, upgrade_part) if {
	is_request
	port_granted
	request_matches != set()
	credentials := {name | some r in request_matches; some name in object.get(r, "credentials", [])}
}

# `upgrade: true` only for a request that asks for one (request_matches then holds a rule that
# lists its protocol).
upgrade_part := {"upgrade": true} if input.connection.upgrade

else := {}

# egress.method_not_allowed: no request rule for the host lists the method.
decision := {"allow": false, "reasons": [{"code": "egress.method_not_allowed", "message": msg}]} if {
	is_request
	not method_listed
	msg := sprintf("%s requests to %s are not allowed for tenant %q", [input.connection.method, input.connection.host, input.execution.tenant])
}

# egress.path_not_allowed: the method is listed, but not for this path.
decision := {"allow": false, "reasons": [{"code": "egress.path_not_allowed", "message": msg}]} if {
	is_request
	method_listed
	path_matches == set()
	msg := sprintf("%s %s on %s is not allowed for tenant %q", [input.connection.method, input.connection.path, input.connection.host, input.execution.tenant])
}

# egress.port_not_granted for a request: cannot happen through the proxy (the tunnel was
# decided first), but a request is never allowed on a port the grant does not list.
decision := {"allow": false, "reasons": [{"code": "egress.port_not_granted", "message": msg}]} if {
	is_request
	request_matches != set()
	not port_granted
	msg := sprintf("%s is not granted on port %d", [input.connection.host, input.connection.port])
}

# egress.upgrade_not_allowed: the path is allowed, but no rule for it lists the protocol the
# request's `Upgrade` asks for.
decision := {"allow": false, "reasons": [{"code": "egress.upgrade_not_allowed", "message": msg}]} if {
	is_request
	path_matches != set()
	request_matches == set()
	msg := sprintf(
		"%s %s on %s may not upgrade to %q for tenant %q (a request rule must list it in `upgrades`)",
		[input.connection.method, input.connection.path, input.connection.host, input.connection.upgrade, input.execution.tenant],
	)
}

method_listed if {
	some r in tenant_requests
	input.connection.method in r.methods
}
