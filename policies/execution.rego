# sandgate execution policy: decides every request to run code (POST /v1/executions).
#
# The gateway asks for `decision` and obeys it. It never adds permissions of its own.
#
# Input (built by the gateway, see README.md):
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
# Writing rules: a deny rule must fire whenever its condition holds, so its message may only use
# values that are always defined (the `default` facts below), never raw input fields that a
# malformed input could leave out.

package sandgate.execution

# ---------------------------------------------------------------------------------------------
# Facts about the request. Each has a default so that a missing input field reads as empty
# instead of silently making a rule undefined.
# ---------------------------------------------------------------------------------------------

# Tenant of the calling API key.
default tenant_name := ""

tenant_name := input.principal.tenant

# The tenant's entry in data/tenants.yaml; undefined when the tenant is not listed.
tenant := data.tenants[tenant_name]

# Languages, backend and limits the tenant's entry grants (empty when missing from the data).
default tenant_languages := []

tenant_languages := tenant.languages

default tenant_backend := ""

tenant_backend := tenant.backend

default tenant_limits := {}

tenant_limits := tenant.limits

# Language the code is written in.
default language := ""

language := input.request.language

# Network destinations (host, port) the client asks to reach.
default requested_network := []

requested_network := input.request.network

# Datasets the client asks to mount, as `dataset:<name>`.
default requested_mounts := []

requested_mounts := input.request.mounts

# Limits the client asks for; only the ones it set are present.
default requested_limits := {}

requested_limits := input.request.limits

# Isolation backends this gateway can start.
default offered_backends := []

offered_backends := input.environment.backends

# ---------------------------------------------------------------------------------------------
# Reasons to deny.
# ---------------------------------------------------------------------------------------------

# tenant.unknown: the API key's tenant is not listed in data/tenants.yaml.
deny contains {"code": "tenant.unknown", "message": msg} if {
	not tenant
	msg := sprintf("tenant %q is not configured", [tenant_name])
}

# language.not_allowed: the tenant exists, but its `languages` do not include the requested one.
deny contains {"code": "language.not_allowed", "message": msg} if {
	tenant
	not language in tenant_languages
	msg := sprintf(
		"language %q is not allowed for tenant %q (allowed: %s)",
		[language, tenant_name, concat(", ", tenant_languages)],
	)
}

# backend.unavailable: the tenant's backend is not one this gateway offers (its config lists
# them), so the code has nowhere it may run. Never fall back to another backend.
deny contains {"code": "backend.unavailable", "message": msg} if {
	tenant
	not tenant_backend in offered_backends
	msg := sprintf(
		"backend %q of tenant %q is not available on this gateway (available: %s)",
		[tenant_backend, tenant_name, concat(", ", offered_backends)],
	)
}

# network.not_allowed: sandboxes get no network access yet (the egress proxy is not in place), so
# asking for any destination denies the whole request rather than running it cut off.
deny contains {"code": "network.not_allowed", "message": msg} if {
	count(requested_network) > 0
	destinations := [sprintf("%v:%v", [d.host, d.port]) | some d in requested_network]
	msg := sprintf("network access is not available yet (requested: %s)", [concat(", ", destinations)])
}

# mount.not_allowed: dataset mounts are not available yet, so asking for any denies the request.
deny contains {"code": "mount.not_allowed", "message": msg} if {
	count(requested_mounts) > 0
	msg := sprintf("dataset mounts are not available yet (requested: %v)", [requested_mounts])
}

# limit.invalid: a requested limit must be a positive number. Zero or a negative value is a
# client bug, not a way to get "no limit".
deny contains {"code": "limit.invalid", "message": msg} if {
	some name, value in requested_limits
	not positive_number(value)
	msg := sprintf("requested limit %v must be a positive number, got %v", [name, value])
}

positive_number(x) if {
	is_number(x)
	x > 0
}

# ---------------------------------------------------------------------------------------------
# What an allowed request gets.
# ---------------------------------------------------------------------------------------------

# The limits the sandbox runs with: for each limit the tenant defines, the tenant's value, or the
# requested value when the client asked for less. A request can lower a limit, never raise it.
effective_limits := {name: lowered(ceiling, name) | some name, ceiling in tenant_limits}

# lowered(ceiling, name) is the requested value for `name` when it is a positive number below
# `ceiling`, and `ceiling` otherwise.
lowered(ceiling, name) := requested_limits[name] if {
	positive_number(requested_limits[name])
	requested_limits[name] < ceiling
} else := ceiling

# ---------------------------------------------------------------------------------------------
# The decision. Exactly one of the two definitions applies.
# ---------------------------------------------------------------------------------------------

# No reason to deny: run on the tenant's backend with the effective limits. No network, no mounts.
decision := {
	"allow": true,
	"require_approval": false,
	"reasons": [],
	"backend": tenant_backend,
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
