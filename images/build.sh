#!/usr/bin/env bash
# Build the sandbox images sandgate/bash and sandgate/python from Debian packages, without any
# container registry: debootstrap a root filesystem, trim it, `docker import` it.
#
# Usage: images/build.sh [--force] [bash|python]...      (default: both; run as root)
# An image is rebuilt only when its recipe hash (this file, package list, suite, mirror, CA
# bundle) differs from the `sandgate.recipe` label of the existing image. See images/README.md.
#
# Environment:
#   SANDGATE_IMAGE_MIRROR          Debian mirror URL (default: the host's first apt source)
#   SANDGATE_IMAGE_SUITE           Debian suite (default: bookworm)
#   SANDGATE_IMAGE_TRUST_HOST_CA   1 (default): the images trust the host's CA bundle
#   SANDGATE_IMAGE_EXTRA_CA        a PEM bundle the images must trust as well
#   SANDGATE_IMAGE_TMPDIR          where root filesystems are assembled (default: /var/tmp)
set -euo pipefail

readonly SUITE=${SANDGATE_IMAGE_SUITE:-bookworm}
readonly TRUST_HOST_CA=${SANDGATE_IMAGE_TRUST_HOST_CA:-1}
readonly EXTRA_CA=${SANDGATE_IMAGE_EXTRA_CA:-}
readonly WORK_PARENT=${SANDGATE_IMAGE_TMPDIR:-/var/tmp}
readonly HOST_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
readonly IMAGE_PATH='PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
# Mount points sandgate uses (tmpfs: workspace, output, tmp; read-only init binary: sandgate;
# egress socket directory: run/sandgate). They exist, empty, in every image.
readonly MOUNT_POINTS=(workspace output tmp run/sandgate sandgate)
readonly ALL_IMAGES=(bash python)
# runsc 20221219 (Debian 12) rejects statx() with AT_NO_AUTOMOUNT (EINVAL), which coreutils 9.1
# ls and stat always pass: `ls -l`, `ls DIR` and `stat` fail in the sandbox. busybox's versions
# use plain stat()/lstat(); they shadow coreutils through /usr/local/bin, first on PATH.
readonly BUSYBOX_SHADOWED=(ls stat)
readonly SELF="${BASH_SOURCE[0]}"
# The program's uid and gid (sandbox-init's identity.rs: PROGRAM_UID, PROGRAM_GID), named
# `user` with home /home/user as E2B's SDKs assume (see name_program_user).
readonly PROGRAM_ID=65534
readonly PROGRAM_PASSWD="user:x:$PROGRAM_ID:$PROGRAM_ID:user:/home/user:/bin/bash"
# Debian's /etc/profile sets PATH for a non-root login shell (`bash -l`, how E2B's SDKs run
# commands), dropping the sandbox's PATH (PYTHONUSERBASE's bin, /usr/local/sbin); see
# keep_login_path.
readonly DEBIAN_LOGIN_PATH='  PATH="/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"'
# shellcheck disable=SC2016 # written literally into /etc/profile
readonly KEPT_LOGIN_PATH='  PATH="${PATH:-/usr/local/bin:/usr/bin:/bin}"'
# Files the python image gets besides its packages (see customise_python).
PYTHON_FILES_DIR="$(dirname "$SELF")/python"
readonly PYTHON_FILES_DIR
readonly USER_SITE_FILES=(sandgate_user_site.py sandgate_user_site.pth)

WORK=""          # temporary build directory, removed on exit
declare -A JOBS=()  # image name -> pid of its build job

log() { printf 'images: %s\n' "$*"; }
die() {
    printf 'images: error: %s\n' "$*" >&2
    exit 1
}

packages_for() {
    case $1 in
    bash) echo busybox,ca-certificates,procps ;;
    python) echo python3,python3-pip,python3-requests,python3-pandas,python3-numpy,python3-matplotlib,python3-pytest,curl,git,busybox,ca-certificates,procps ;;
    *) die "unknown image '$1' (known: ${ALL_IMAGES[*]})" ;;
    esac
}

# detect_mirror: the Debian mirror this host's apt already uses, so that no mirror name lives in
# the repository: the first URIs: of debian.sources, else the first deb line of sources.list.
detect_mirror() {
    if [[ -n ${SANDGATE_IMAGE_MIRROR:-} ]]; then
        printf '%s\n' "$SANDGATE_IMAGE_MIRROR"
        return
    fi
    local uri=""
    if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
        uri=$(awk 'tolower($1) == "uris:" { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
    fi
    if [[ -z $uri && -r /etc/apt/sources.list ]]; then
        # deb [option=value ...] URI suite component...
        uri=$(awk '$1 == "deb" {
            i = 2
            if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
            print $i; exit
        }' /etc/apt/sources.list)
    fi
    [[ -n $uri ]] || die "no Debian mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list; set SANDGATE_IMAGE_MIRROR"
    printf '%s\n' "$uri"
}

# ca_bundles: the PEM bundles the images must trust in addition to Debian's own.
ca_bundles() {
    if [[ $TRUST_HOST_CA == 1 && -r $HOST_CA_BUNDLE ]]; then
        printf '%s\n' "$HOST_CA_BUNDLE"
    fi
    if [[ -n $EXTRA_CA ]]; then
        [[ -r $EXTRA_CA ]] || die "SANDGATE_IMAGE_EXTRA_CA=$EXTRA_CA is not a readable file"
        printf '%s\n' "$EXTRA_CA"
    fi
}

# recipe_for NAME MIRROR CA_DIGEST: everything that determines the image, hashed.
recipe_for() {
    {
        cat "$SELF"
        if [[ $1 == python ]]; then
            local file
            for file in "${USER_SITE_FILES[@]}"; do
                cat "$PYTHON_FILES_DIR/$file"
            done
        fi
        printf 'image=%s\npackages=%s\nsuite=%s\nmirror=%s\nca=%s\n' \
            "$1" "$(packages_for "$1")" "$SUITE" "$2" "$3"
    } | sha256sum | cut -d' ' -f1
}

current_recipe() {
    timeout 30 docker image inspect -f '{{index .Config.Labels "sandgate.recipe"}}' \
        "sandgate/$1:latest" 2>/dev/null || true
}

# mounts_under DIR: mount points below DIR, deepest first.
mounts_under() {
    awk -v root="$1/" 'index($2, root) == 1 { print $2 }' /proc/self/mounts | sort -r
}

# install_extra_cas ROOTFS BUNDLE...: add every certificate of the bundles that the image's own
# bundle lacks (e.g. the CA of a TLS-inspecting firewall) to /usr/local/share/ca-certificates,
# then let the image's update-ca-certificates rebuild /etc/ssl/certs. pip, requests and curl in
# Debian use that system bundle.
install_extra_cas() {
    local rootfs=$1
    shift
    (($# > 0)) || return 0
    local image_bundle="$rootfs/etc/ssl/certs/ca-certificates.crt"
    local dest="$rootfs/usr/local/share/ca-certificates/sandgate"
    [[ -r $image_bundle ]] || die "$image_bundle missing: is ca-certificates in the package list?"
    mkdir -p "$dest"
    local added
    added=$(awk -v image="$image_bundle" -v dest="$dest" '
        { sub(/\r$/, "") }
        /-----BEGIN CERTIFICATE-----/ { inside = 1; pem = ""; body = "" }
        inside { pem = pem $0 "\n"; if ($0 !~ /-----/) body = body $0 }
        inside && /-----END CERTIFICATE-----/ {
            inside = 0
            if (FILENAME == image) { known[body] = 1 }
            else if (!(body in known)) {
                known[body] = 1
                file = sprintf("%s/extra-%04d.crt", dest, ++n)
                printf "%s", pem > file
                close(file)
            }
        }
        END { print n + 0 }
    ' "$image_bundle" "$@")
    if ((added == 0)); then
        rmdir "$dest"
        log "the image's CA bundle already holds every certificate of: $*"
        return
    fi
    chroot "$rootfs" /usr/sbin/update-ca-certificates >/dev/null
    log "added $added CA certificate(s) from: $*"
}

# prepare_rootfs ROOTFS: drop apt caches and host leftovers, create the mount points.
prepare_rootfs() {
    local rootfs=$1
    [[ -z $(mounts_under "$rootfs") ]] || die "something is still mounted under $rootfs"
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
        "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/bootstrap.log
    mkdir -p "$rootfs/var/lib/apt/lists/partial"
    # debootstrap copies the host's resolver and host name; docker provides its own at run time.
    : >"$rootfs/etc/resolv.conf"
    echo sandbox >"$rootfs/etc/hostname"
    local dir
    for dir in "${MOUNT_POINTS[@]}"; do
        rm -rf "${rootfs:?}/$dir"
        mkdir -p "$rootfs/$dir"
        chown 0:0 "$rootfs/$dir"
        chmod 0755 "$rootfs/$dir"
    done
    chmod 1777 "$rootfs/tmp"
    local tool
    for tool in "${BUSYBOX_SHADOWED[@]}"; do
        ln -sfn /bin/busybox "$rootfs/usr/local/bin/$tool"
    done
}

# name_program_user ROOTFS: the program's uid and gid (Debian's `nobody` and `nogroup`, which
# nothing in the image runs as) become `user`, home /home/user, shell bash: `whoami`, `id`,
# `~user` and `ls -l` then say what E2B's SDKs expect. /home/user itself is not in the image:
# the gateway mounts a size-capped tmpfs there in every sandbox (runsc creates the mount point).
name_program_user() {
    local etc="$1/etc"
    sed -i "s|^nobody:x:$PROGRAM_ID:$PROGRAM_ID:.*\$|$PROGRAM_PASSWD|" "$etc/passwd"
    sed -i "s|^nogroup:x:$PROGRAM_ID:|user:x:$PROGRAM_ID:|" "$etc/group"
    sed -i 's|^nobody:|user:|' "$etc/shadow"
    sed -i 's|^nogroup:|user:|' "$etc/gshadow"
    grep -qx "$PROGRAM_PASSWD" "$etc/passwd" || die "no nobody:x:$PROGRAM_ID entry became user in $etc/passwd"
    grep -q "^user:x:$PROGRAM_ID:" "$etc/group" || die "no nogroup:x:$PROGRAM_ID entry became user in $etc/group"
}

# keep_login_path ROOTFS: a login shell keeps the PATH the sandbox was given.
keep_login_path() {
    local profile="$1/etc/profile"
    grep -qxF "$DEBIAN_LOGIN_PATH" "$profile" || die "$profile no longer sets PATH as expected"
    # (Neither line has a backslash, which awk -v would read as an escape.)
    awk -v from="$DEBIAN_LOGIN_PATH" -v to="$KEPT_LOGIN_PATH" \
        '$0 == from { print to; next } { print }' "$profile" >"$profile.sandgate"
    mv "$profile.sandgate" "$profile"
    chmod 0644 "$profile"
}

# import_rootfs NAME RECIPE ROOTFS: import as sandgate/NAME:latest.
import_rootfs() {
    local name=$1 recipe=$2 rootfs=$3 ref="sandgate/$1:latest"
    tar --numeric-owner -C "$rootfs" -c . |
        timeout 900 docker import \
            --change "ENV $IMAGE_PATH" \
            --change "LABEL sandgate.image=$name sandgate.recipe=$recipe" \
            --change 'CMD ["/bin/bash"]' \
            - "$ref" >/dev/null
}

# prune_replaced: delete the untagged images earlier builds replaced, unless a container uses them.
prune_replaced() {
    timeout 300 docker image prune --force --filter label=sandgate.image >/dev/null \
        || log "could not prune replaced images (docker image prune --filter label=sandgate.image)"
}

# customise_python ROOTFS: make `pip install x` work without flags for the sandbox's user. The
# root file system is read-only at run time and the user is not root, so pip cannot touch the
# system's packages, and PEP 668's EXTERNALLY-MANAGED marker protects nothing: it goes. pip then
# falls back to a user installation under PYTHONUSERBASE (the gateway sets /workspace/.local);
# sandgate_user_site.pth makes that directory importable from the interpreter's start.
customise_python() {
    local rootfs=$1 file dest="$1/usr/lib/python3/dist-packages"
    [[ -d $dest ]] || die "$dest missing: is python3 in the package list?"
    rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
    for file in "${USER_SITE_FILES[@]}"; do
        install -m 0644 "$PYTHON_FILES_DIR/$file" "$dest/$file"
    done
    log "sandgate/python: pip installs into PYTHONUSERBASE (EXTERNALLY-MANAGED removed)"
}

# build_image NAME RECIPE MIRROR BUNDLE...: the whole build of one image (runs as a job).
build_image() {
    local name=$1 recipe=$2 mirror=$3
    shift 3
    local rootfs="$WORK/$name" start=$SECONDS
    log "sandgate/$name: debootstrap $SUITE ($(packages_for "$name"))"
    timeout 1800 debootstrap --variant=minbase --include="$(packages_for "$name")" \
        "$SUITE" "$rootfs" "$mirror"
    install_extra_cas "$rootfs" "$@"
    if [[ $name == python ]]; then
        customise_python "$rootfs"
    fi
    prepare_rootfs "$rootfs"
    name_program_user "$rootfs"
    keep_login_path "$rootfs"
    log "sandgate/$name: importing $(du -sh "$rootfs" | cut -f1) (debootstrap took $((SECONDS - start))s)"
    start=$SECONDS
    import_rootfs "$name" "$recipe" "$rootfs"
    log "sandgate/$name: imported in $((SECONDS - start))s"
}

# kill_tree PID: stop a build job and everything it started (debootstrap, tar, docker).
kill_tree() {
    local child
    for child in $(pgrep -P "$1" || true); do
        kill_tree "$child"
    done
    kill -TERM "$1" 2>/dev/null || true
}

cleanup() {
    local pid mount
    for pid in "${JOBS[@]}"; do
        kill_tree "$pid"
    done
    [[ -n $WORK && -d $WORK ]] || return 0
    wait 2>/dev/null || true
    # debootstrap mounts /proc, /sys (and may bind /dev) inside the target; an interrupted run
    # can leave them. Never rm -rf through a mount.
    while read -r mount; do
        umount -l "$mount" || true
    done < <(mounts_under "$WORK")
    if [[ -n $(mounts_under "$WORK") ]]; then
        printf 'images: error: mounts remain under %s; unmount them and remove it by hand\n' "$WORK" >&2
        return 0
    fi
    local start=$SECONDS
    rm -rf --one-file-system "$WORK"
    log "removed $WORK in $((SECONDS - start))s"
}

main() {
    local force=0 names=() arg
    for arg in "$@"; do
        case $arg in
        --force) force=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'
            return 0
            ;;
        -*) die "unknown option $arg (try --help)" ;;
        *)
            packages_for "$arg" >/dev/null
            [[ " ${names[*]} " == *" $arg "* ]] || names+=("$arg")
            ;;
        esac
    done
    ((${#names[@]} > 0)) || names=("${ALL_IMAGES[@]}")
    [[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap and chroot need it)"
    local tool
    for tool in debootstrap docker chroot tar sha256sum; do
        command -v "$tool" >/dev/null || die "$tool not found: run scripts/setup.sh first"
    done
    timeout 10 docker info >/dev/null 2>&1 || die "dockerd does not answer: run scripts/setup.sh first"
    mkdir -p "$WORK_PARENT"
    exec 9>"$WORK_PARENT/sandgate-images.lock"
    if ! flock -n 9; then
        log "another images/build.sh is running; waiting for it"
        flock 9
    fi

    local mirror bundles=() ca_digest
    mirror=$(detect_mirror)
    mapfile -t bundles < <(ca_bundles)
    ca_digest=$(if ((${#bundles[@]})); then cat "${bundles[@]}"; fi | sha256sum | cut -d' ' -f1)

    local todo=() recipes=() name recipe
    for name in "${names[@]}"; do
        recipe=$(recipe_for "$name" "$mirror" "$ca_digest")
        if ((force == 0)) && [[ $(current_recipe "$name") == "$recipe" ]]; then
            log "sandgate/$name is up to date (recipe ${recipe:0:12})"
            continue
        fi
        todo+=("$name")
        recipes+=("$recipe")
    done
    ((${#todo[@]} > 0)) || return 0

    WORK=$(mktemp -d "$WORK_PARENT/sandgate-images.XXXXXX")
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    log "building ${todo[*]} in $WORK from $mirror (about 2 minutes)"

    local i start=$SECONDS
    for i in "${!todo[@]}"; do
        build_image "${todo[i]}" "${recipes[i]}" "$mirror" "${bundles[@]}" \
            >"$WORK/${todo[i]}.log" 2>&1 &
        JOBS[${todo[i]}]=$!
    done
    local failed=()
    for name in "${todo[@]}"; do
        if wait "${JOBS[$name]}"; then
            grep '^images: ' "$WORK/$name.log" || true
            log "built sandgate/$name after $((SECONDS - start))s"
        else
            failed+=("$name")
            printf 'images: sandgate/%s failed; last lines of its log:\n' "$name" >&2
            tail -n 30 "$WORK/$name.log" >&2
        fi
        unset "JOBS[$name]"
    done
    prune_replaced
    ((${#failed[@]} == 0)) || die "could not build: ${failed[*]} (rerun with the log above in mind)"
}

main "$@"
