# sandgate execution policy: decides every request to run code (POST /v1/executions).
#
# The gateway asks for `decision` and obeys it; it never adds permissions of its own.
#
# Input (built by the gateway; README.md shows a complete example):
#   input.principal    who asks: key_id, tenant, role
#   input.request      what they ask for: language, code_sha256, code_bytes, files, network,
#                      mounts, limits (only those the client set), labels
#   input.environment  what this gateway can offer: backends, datasets, now
#
# Data: data.tenants, from data/tenants.yaml.
#
# How a request is decided:
#   1. Each `deny contains ...` rule below is one reason to refuse, with a stable `code` (used in
#      metrics, audit queries and by clients) and a human `message`.
#   2. No reason at all: the request is allowed, on the tenant's backend, with the tenant's limits
#      lowered to whatever the client asked for when that is less.
#   3. One or more reasons: the request is denied and every reason is reported.
#   4. Anything else (say, a tenant in data/tenants.yaml without `limits`) leaves `decision`
#      undefined or malformed, and sandgate denies with `policy.error`. Mistakes fail closed.
#
# The output must keep exactly the fields of DESIGN.md section 4.3; an unknown field is also a
# `policy.error` deny.
#
# Two rules for whoever edits this file:
#   - A deny rule must fire whenever its condition holds, so its message may only use values that
#     are sure to exist: the input fields checked by `input_complete`, or `object.get` with a
#     default for tenant data.
#   - Every rule and every builtin call costs time on every request (a decision must stay well
#     under 50 µs): prefer plain comparisons, and put the cheap, usually-false condition first.

package sandgate.execution

# ---------------------------------------------------------------------------------------------
# Reasons to deny.
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
}

# The calling key's tenant, from data/tenants.yaml; undefined when the tenant is not listed.
tenant := data.tenants[input.principal.tenant]

# tenant.unknown: the API key's tenant is not listed in data/tenants.yaml.
deny contains {"code": "tenant.unknown", "message": msg} if {
	not tenant
	msg := sprintf("tenant %q is not configured", [input.principal.tenant])
}

# language.not_allowed: the tenant's `languages` do not include the requested language.
deny contains {"code": "language.not_allowed", "message": msg} if {
	tenant
	not input.request.language in tenant.languages
	msg := sprintf(
		"language %q is not allowed for tenant %q (allowed: %s)",
		[input.request.language, input.principal.tenant, concat(", ", object.get(tenant, "languages", []))],
	)
}

# backend.unavailable: the tenant's backend is not one this gateway offers (its config lists
# them), so the code has nowhere it may run. There is no fallback to another backend.
deny contains {"code": "backend.unavailable", "message": msg} if {
	tenant
	not tenant.backend in input.environment.backends
	msg := sprintf(
		"backend %q of tenant %q is not available on this gateway (available: %s)",
		[object.get(tenant, "backend", ""), input.principal.tenant, concat(", ", input.environment.backends)],
	)
}

# network.not_allowed: sandboxes get no network access yet (the egress proxy is not in place), so
# asking for any destination denies the whole request rather than running it cut off.
deny contains {"code": "network.not_allowed", "message": msg} if {
	input.request.network != []
	destinations := [sprintf("%v:%v", [d.host, d.port]) | some d in input.request.network]
	msg := sprintf("network access is not available yet (requested: %s)", [concat(", ", destinations)])
}

# mount.not_allowed: dataset mounts are not available yet, so asking for any denies the request.
deny contains {"code": "mount.not_allowed", "message": msg} if {
	input.request.mounts != []
	msg := sprintf("dataset mounts are not available yet (requested: %v)", [input.request.mounts])
}

# limit.invalid: a requested limit must be greater than zero. Zero is a client bug, not a way to
# ask for "no limit".
deny contains {"code": "limit.invalid", "message": msg} if {
	some name, value in input.request.limits
	not value > 0
	msg := sprintf("requested limit %v must be greater than zero, got %v", [name, value])
}

# ---------------------------------------------------------------------------------------------
# What an allowed request gets.
# ---------------------------------------------------------------------------------------------

# The limits the sandbox runs with: the tenant's limits, except where the client asked for a
# lower value, which then replaces the tenant's. A request can lower a limit, never raise it,
# and cannot add a limit the tenant does not define.
effective_limits := object.union(tenant.limits, {name: requested |
	some name, requested in input.request.limits
	requested < tenant.limits[name]
})

# ---------------------------------------------------------------------------------------------
# The decision. Exactly one of the two definitions applies.
# ---------------------------------------------------------------------------------------------

# No reason to deny: run on the tenant's backend with the effective limits. No network, no mounts.
decision := {
	"allow": true,
	"require_approval": false,
	"reasons": [],
	"backend": tenant.backend,
	"mounts": [],
	"limits": effective_limits,
} if {
	count(deny) == 0
}

# At least one reason to deny: refuse and report every reason (sorted by code).
decision := {
	"allow": false,
	"require_approval": false,
	"reasons": sort(deny),
} if {
	count(deny) > 0
}
