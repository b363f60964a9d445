# sandgate execution policy: decides every request to run code (POST /v1/executions).
#
# The gateway asks for `decision` and obeys it; it never adds permissions of its own.
#
# Input (built by the gateway; README.md shows a complete example):
#   input.principal    who asks: key_id, tenant, role
#   input.request      what they ask for: language, code_sha256, code_bytes, files, network
#                      ([{host, port}]), mounts (["dataset:<name>"]), limits (only those the
#                      client set), labels
#   input.environment  what this gateway can offer: backends, datasets, now
#
# Data: data.tenants, from data/tenants.yaml.
#
# How a request is decided:
#   1. Each `... contains {"code": ..., "message": ...}` rule below is one reason to refuse, with
#      a stable `code` (used in metrics, audit queries and by clients) and a human `message`.
#      One or more reasons: the request is denied and every reason is reported, sorted by code.
#   2. No reason to deny, but the request asks for a network destination the tenant's allowlist
#      does not cover, and the tenant sends those to review: the request waits for a human
#      reviewer (`allow: true, require_approval: true`, reason `network.review_required`). What the
#      reviewer approves is the rest of the decision, which grants the requested destinations.
#   3. Otherwise the request is allowed as is.
#   An allowed (or reviewed) request runs on the tenant's backend, with the tenant's limits
#   lowered to whatever the client asked for when that is less, the datasets it asked for
#   mounted read-only, and exactly the network destinations it asked for: never more.
#   4. Anything else (say, a tenant in data/tenants.yaml without `limits`) leaves `decision`
#      undefined or malformed, and sandgate denies with `policy.error`. Mistakes fail closed.
#
# The output must keep exactly the fields of DESIGN.md section 4.3; an unknown field is also a
# `policy.error` deny, and so is a network grant holding `*`, `*.com`, upper case or port 0.
#
# Three rules for whoever edits this file:
#   - A deny rule must fire whenever its condition holds, so its message may only use values that
#     are sure to exist: the input fields checked by `input_complete`, or `object.get` with a
#     default for tenant data.
#   - Reasons are in three sets. `deny` is looked at for every request; `network_deny` only for
#     a request that asks for a network destination, and `mount_deny` only for one that asks for
#     a mount (see `reasons`). A rule in `network_deny` or `mount_deny` must therefore only be
#     able to fire for what was asked (iterate over `input.request.network` or `.mounts`, or over
#     a set built from them); anything else belongs in `deny`.
#   - Every rule evaluated costs 2-3 µs on every request, every builtin call about 1.5 µs (a
#     decision should stay under 50 µs): prefer plain comparisons, put the cheap, usually-false
#     condition first, and build messages only once the condition holds. README.md has numbers.

package sandgate.execution

# The calling key's tenant, from data/tenants.yaml; undefined when the tenant is not listed.
tenant := data.tenants[input.principal.tenant]

# ---------------------------------------------------------------------------------------------
# Reasons any request can hit: `deny`.
# ---------------------------------------------------------------------------------------------

# input.malformed: a field the rules below rely on is missing. The gateway always sends them all;
# this only guards hand-written inputs (`sandgate policy eval`, dry runs), so that a missing field
# can never make a deny rule below silently not fire.
deny contains {"code": "input.malformed", "message": "the input lacks fields this policy needs"} if {
	not input_complete
}

input_complete if {
	input.principal.tenant
	input.request.language
	input.request.network
	input.request.mounts
	input.request.limits
	input.environment.backends
	input.environment.datasets
}

# tenant.unknown: the API key's tenant is not listed in data/tenants.yaml.
deny contains {"code": "tenant.unknown", "message": msg} if {
	not tenant
	msg := sprintf("tenant %q is not configured", [input.principal.tenant])
}

# language.not_allowed: the tenant's `languages` do not include the requested language.
deny contains {"code": "language.not_allowed", "message": msg} if {
	not input.request.language in tenant.languages
	tenant
	msg := sprintf(
		"language %q is not allowed for tenant %q (allowed: %s)",
		[input.request.language, input.principal.tenant, concat(", ", object.get(tenant, "languages", []))],
	)
}

# session.not_allowed: opening a session (`request.kind: "session"`, DESIGN.md section 10) needs
# `sessions: true` in the tenant's entry. Each execution in a session is decided again, as
# `request.kind: "session_execution"`, by every other rule here.
deny contains {"code": "session.not_allowed", "message": msg} if {
	input.request.kind == "session"
	not object.get(tenant, "sessions", false) == true
	tenant
	msg := sprintf("tenant %q may not open sessions", [input.principal.tenant])
}

# backend.unavailable: the tenant's backend is not one this gateway offers (its config lists
# them), so the code has nowhere it may run. There is no fallback to another backend.
deny contains {"code": "backend.unavailable", "message": msg} if {
	not tenant.backend in input.environment.backends
	tenant
	msg := sprintf(
		"backend %q of tenant %q is not available on this gateway (available: %s)",
		[object.get(tenant, "backend", ""), input.principal.tenant, concat(", ", input.environment.backends)],
	)
}

# limit.invalid: a requested limit must be greater than zero. Zero is a client bug, not a way to
# ask for "no limit".
deny contains {"code": "limit.invalid", "message": msg} if {
	some name, value in input.request.limits
	not value > 0
	msg := sprintf("requested limit %v must be greater than zero, got %v", [name, value])
}

# ---------------------------------------------------------------------------------------------
# Reasons only a request for network destinations can hit: `network_deny`.
# ---------------------------------------------------------------------------------------------

# network.invalid_destination: a requested destination must be one concrete, canonical host name
# (lower case, no wildcard, no leading or trailing dot) and a port from 1 to 65535. Wildcards
# belong in the tenant's allowlist, never in a request: a reviewer is never asked to approve
# `*.com`. (Plain string checks, not a regex: a regex costs ~20 µs per call here. Whatever else is
# wrong with a name, say a space, cannot reach the sandbox either: sandgate refuses a decision
# whose grant holds a malformed host, with `policy.error`.)
network_deny contains {"code": "network.invalid_destination", "message": msg} if {
	some d in invalid_destinations
	msg := sprintf("requested destination %v:%v is not a lower-case host name and a port 1-65535", [d.host, d.port])
}

invalid_destinations contains d if {
	some d in input.request.network
	not valid_destination(d)
}

valid_destination(d) if {
	d.port >= 1
	d.port <= 65535
	d.host != ""
	d.host == lower(d.host)
	not contains(d.host, "*")
	not startswith(d.host, ".")
	not endswith(d.host, ".")
}

# network.not_allowed: the request asks for destinations the tenant's allowlist does not cover,
# and the tenant does not send those to review (forge and classroom have no network at all).
network_deny contains {"code": "network.not_allowed", "message": msg} if {
	unlisted != set()
	tenant
	not tenant.network.review_unlisted_hosts
	msg := sprintf(
		"tenant %q may not reach %s (not in its allowlist, and it does not send other destinations to review)",
		[input.principal.tenant, concat(", ", unlisted)],
	)
}

# Requested destinations (as `host:port` text) that no entry of the tenant's `network.allow`
# covers. An entry covers a destination when its host pattern matches the host and its ports
# include the port. A tenant without `network` covers nothing.
unlisted contains sprintf("%s:%d", [d.host, d.port]) if {
	some d in input.request.network
	not d in invalid_destinations
	not covered(d)
}

covered(d) if {
	some rule in tenant.network.allow
	d.port in rule.ports
	host_matches(rule.host, d.host)
}

# A pattern matches a host when it is the host itself, or when it is `*.<name>` and the host ends
# in `.<name>`: `*.example.com` matches `a.example.com` and `a.b.example.com`, not `example.com`
# and not `badexample.com` (the match is on a label boundary).
host_matches(pattern, host) if pattern == host

host_matches(pattern, host) if {
	startswith(pattern, "*.")
	endswith(host, trim_prefix(pattern, "*"))
}

# ---------------------------------------------------------------------------------------------
# Reasons only a request for mounts can hit: `mount_deny`.
# ---------------------------------------------------------------------------------------------

# mount.invalid: a mount must be written `dataset:<name>`.
mount_deny contains {"code": "mount.invalid", "message": msg} if {
	some mount in input.request.mounts
	not dataset_name(mount)
	msg := sprintf("mount %q is not of the form dataset:<name>", [mount])
}

# mount.not_allowed: the tenant's `datasets` do not include a requested dataset.
mount_deny contains {"code": "mount.not_allowed", "message": msg} if {
	some name in requested_datasets
	not name in object.get(tenant, "datasets", [])
	tenant
	msg := sprintf("tenant %q may not mount dataset %q", [input.principal.tenant, name])
}

# mount.unavailable: the tenant may use the dataset, but this gateway does not offer it.
mount_deny contains {"code": "mount.unavailable", "message": msg} if {
	some name in requested_datasets
	not name in input.environment.datasets
	name in object.get(tenant, "datasets", [])
	msg := sprintf("dataset %q is not available on this gateway (available: %v)", [name, input.environment.datasets])
}

# `dataset:census` -> `census`; undefined for any other form (and for an empty name).
dataset_name(mount) := name if {
	startswith(mount, "dataset:")
	name := trim_prefix(mount, "dataset:")
	name != ""
}

requested_datasets contains name if {
	some mount in input.request.mounts
	name := dataset_name(mount)
}

# ---------------------------------------------------------------------------------------------
# All the reasons to deny.
# ---------------------------------------------------------------------------------------------

# `network_deny` is only looked at when the request asks for a destination, `mount_deny` only
# when it asks for a mount: their rules iterate over what was asked, so an empty request cannot
# hit them, and skipping them keeps the most common decisions fast.
reasons := deny if {
	input.request.network == []
	input.request.mounts == []
} else := deny | network_deny if {
	input.request.mounts == []
} else := deny | mount_deny if {
	input.request.network == []
} else := (deny | network_deny) | mount_deny

# ---------------------------------------------------------------------------------------------
# What an allowed request gets. Only ever part of a decision when `reasons` is empty.
# ---------------------------------------------------------------------------------------------

# The limits the sandbox runs with: the tenant's limits, except where the client asked for a
# lower value, which then replaces the tenant's. A request can lower a limit, never raise it,
# and cannot add a limit the tenant does not define.
effective_limits := tenant.limits if {
	input.request.limits == {}
} else := object.union(tenant.limits, {name: requested |
	some name, requested in input.request.limits
	requested < tenant.limits[name]
})

# Each dataset asked for (once, even if asked twice), read-only at /data/<name>. No reason to
# deny means each is one the tenant may use and this gateway offers.
mounts := [] if {
	input.request.mounts == []
} else := [{"dataset": name, "target": concat("", ["/data/", name]), "read_only": true} |
	some name in requested_datasets
]

# The network part of the decision.
#   - No destination asked for: no grant at all (`network` absent), nothing to review.
#   - Every destination covered by the allowlist: the grant, no review.
#   - Some destination not covered (and the tenant reviews those, or `network_deny` would have
#     denied): the grant, held for a reviewer, who sees what is asked in the reason.
network_part := {"require_approval": false, "reasons": []} if {
	input.request.network == []
} else := {"require_approval": false, "reasons": [], "network": grant} if {
	unlisted == set()
} else := {"require_approval": true, "reasons": [review], "network": grant}

review := {
	"code": "network.review_required",
	"message": sprintf(
		"%s not in the allowlist of tenant %q: a reviewer must approve",
		[concat(", ", unlisted), input.principal.tenant],
	),
}

# The grant holds exactly the requested destinations (each host once, with the ports asked for
# it), plus the tenant's connection and volume caps: what is covered by the allowlist and, in a
# review, what the reviewer approves. Never a pattern from the allowlist, never another host.
grant := {
	"allow": [object.union(
		{"host": host, "ports": sort({d.port | some d in input.request.network; d.host == host})},
		inspection(host),
	) |
		some host in {d.host | some d in input.request.network}
	],
	"max_connections": tenant.network.max_connections,
	"max_bytes": tenant.network.max_bytes,
}

# A requested host that the tenant's allowlist names exactly with `inspect: true` is granted for
# inspection, with the credentials that rule lists (DESIGN section 11): the proxy then terminates
# TLS to it and decides each request (egress.rego). Any other host is a plain tunnel.
inspection(host) := {"inspect": true, "credentials": object.get(rule, "credentials", [])} if {
	some rule in tenant.network.allow
	rule.host == host
	object.get(rule, "inspect", false) == true
} else := {}

# ---------------------------------------------------------------------------------------------
# The decision. Exactly one of the two definitions applies.
# ---------------------------------------------------------------------------------------------

# At least one reason to deny: refuse and report every reason (sorted by code).
decision := {
	"allow": false,
	"require_approval": false,
	"reasons": sort(reasons),
} if {
	reasons != set()
}

# No reason to deny: run on the tenant's backend, with its mounts, limits and network part
# (and, in a session another key opened, the reason that shares it).
decision := object.union(network_part, {
	"allow": true,
	"backend": tenant.backend,
	"mounts": mounts,
	"limits": effective_limits,
	"reasons": array.concat(network_part.reasons, session_shared),
}) if {
	reasons == set()
}

# ---------------------------------------------------------------------------------------------
# Sharing a session (README.md, "Sharing sessions").
# ---------------------------------------------------------------------------------------------

# session.shared: a session belongs to the key that opened it. sandgate lets another key of the
# tenant see or use it only when the decision for that key (`kind: "session_execution"`, with
# `request.session.owner` and `.asked_by`) allows and carries this reason; otherwise the
# session is not found. The tenant's `share_sessions` says with whom: `principal` (the keys of
# the owner's principal) or `tenant` (every agent key of the tenant). Absent: nobody.
session_shared := [] if {
	input.request.kind != "session_execution"
} else := [{"code": "session.shared", "message": msg}] if {
	input.request.session.owner.key_id != input.principal.key_id
	shares_sessions
	msg := sprintf(
		"session %s of key %s is shared with key %s (tenant %q shares sessions by %s)",
		[input.request.session.id, input.request.session.owner.key_id, input.principal.key_id, input.principal.tenant, tenant.share_sessions],
	)
} else := []

shares_sessions if tenant.share_sessions == "tenant"

shares_sessions if {
	tenant.share_sessions == "principal"
	input.request.session.owner.principal == input.request.session.asked_by.principal
}
