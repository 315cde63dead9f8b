#!/usr/bin/env bash
# The Java proof of bindings/swig/flatmem.i, against an INSTALLED flatmem:
#   1. swig -java (package flatmem) on the same interface the Python module comes from;
#   2. the JNI library libflatmemjni.so, built with `pkg-config flatmem` from PREFIX and an
#      rpath to its libdir;
#   3. javac of the generated classes, the binding's own classes (bindings/java/flatmem/:
#      FlatmemException, FlatmemArgumentException), the tests in bindings/java/ and the
#      ```java snippet of bindings/python/README.md;
#   4. runs FlatmemTest (loss and ds vs ContrastiveReference, statuses as exceptions),
#      CommTest (a CommLocalGroup in-process, then 2, 3 and 4 RankWorker JVMs over UCX on
#      loopback, each with a hard deadline: messages, all-reduce, the ring loss vs the double
#      reference of the global batch, cyclic SYNC = SGD, a killed rank), the README snippet,
#      and the version check (a fake flatmem_version via LD_PRELOAD must make loading fail
#      with UnsatisfiedLinkError).
# Output in build/java/ (replaced on each run). Exits non-zero on any failure.
# Usage: bash scripts/check-java.sh [PREFIX]   (default $FLATMEM_PREFIX = build/prefix)
# JAVA_HOME picks the JDK (default: the one of javac on PATH).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
fail() { echo "check-java: FAIL: $*" >&2; exit 1; }

prefix=$(cd "${1:-$FLATMEM_PREFIX}" 2>/dev/null && pwd) ||
  fail "no install prefix ${1:-$FLATMEM_PREFIX} (cmake --install build --prefix ...)"
pc=$(find "$prefix" -name flatmem.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "no flatmem.pc under $prefix"
export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
command -v swig >/dev/null || fail "swig not found (scripts/install-deps.sh installs it)"
if [ -z "${JAVA_HOME:-}" ]; then
  javac=$(command -v javac) || fail "javac not found (scripts/install-deps.sh installs openjdk-17-jdk-headless)"
  JAVA_HOME=$(dirname "$(dirname "$(readlink -f "$javac")")")
fi
[ -f "$JAVA_HOME/include/jni.h" ] || fail "no JNI headers in $JAVA_HOME/include"
out=$FLATMEM_ROOT/build/java
rm -rf "$out"
mkdir -p "$out/src/flatmem" "$out/classes" "$out/example"
libdir=$(pkg-config --variable=libdir flatmem)

step "swig -java bindings/swig/flatmem.i (flatmem $(pkg-config --modversion flatmem) in $prefix)"
# shellcheck disable=SC2046  # pkg-config output is a word list
swig -java -package flatmem $(pkg-config --cflags-only-I flatmem) -outdir "$out/src/flatmem" \
     -o "$out/flatmem_wrap.c" "$FLATMEM_ROOT/bindings/swig/flatmem.i"
ls "$out/src/flatmem"

step "JNI library build/java/libflatmemjni.so"
# -fno-strict-aliasing: SWIG's Java wrappers pun jlong and pointers (its documentation asks for it).
# shellcheck disable=SC2046
cc -O2 -shared -fPIC -fno-strict-aliasing -Wall -Wextra -Wno-unused-parameter \
   -I"$JAVA_HOME/include" -I"$JAVA_HOME/include/linux" "$out/flatmem_wrap.c" \
   $(pkg-config --cflags --libs flatmem) -Wl,-rpath,"$libdir" -o "$out/libflatmemjni.so"
ldd "$out/libflatmemjni.so" | grep -F "$libdir/libflatmem.so" || fail "libflatmemjni.so does not load libflatmem from $libdir"

step "javac"
# The README's Java snippet, verbatim.
awk '/^```java$/ { inside = 1; next } /^```$/ { inside = 0 } inside' \
  "$FLATMEM_ROOT/bindings/python/README.md" >"$out/example/ClipLossExample.java"
grep -q "class ClipLossExample" "$out/example/ClipLossExample.java" || fail "no ClipLossExample in the README's java block"
"$JAVA_HOME/bin/javac" -Xlint:all -d "$out/classes" "$out"/src/flatmem/*.java \
  "$FLATMEM_ROOT"/bindings/java/flatmem/*.java "$FLATMEM_ROOT"/bindings/java/*.java "$out/example/ClipLossExample.java"

java=("$JAVA_HOME/bin/java" -Xcheck:jni -Djava.library.path="$out" -cp "$out/classes")
step "FlatmemTest"
"${java[@]}" FlatmemTest

step "CommTest: 2, 3 and 4 RankWorker JVMs over UCX on loopback"
# CommTest gives every child a hard deadline (45 s per run); `timeout` bounds CommTest itself.
timeout -k 5 170 "${java[@]}" CommTest || fail "CommTest failed (or ran past 170 s)"

step "README snippet (ClipLossExample)"
"${java[@]}" ClipLossExample | tee "$out/example/output.txt"
grep -q "^loss [0-9.,]*, dL/ds -\?[0-9.,]*$" "$out/example/output.txt" || fail "ClipLossExample printed no loss"
grep -qF "FLATMEM_STATUS_NON_FINITE: q: element (0, 0) is nan" "$out/example/output.txt" ||
  fail "ClipLossExample printed no NON_FINITE message"

step "version check: a library reporting another version is refused"
cat >"$out/fake_version.c" <<'C'
int flatmem_version(void) { return 90909; }
const char *flatmem_version_string(void) { return "9.9.9"; }
C
cc -shared -fPIC "$out/fake_version.c" -o "$out/libfake_version.so"
if LD_PRELOAD="$out/libfake_version.so" "${java[@]}" FlatmemTest >"$out/mismatch.txt" 2>&1; then
  cat "$out/mismatch.txt"
  fail "FlatmemTest ran against a library reporting version 9.9.9"
fi
grep -F "java.lang.UnsatisfiedLinkError: flatmem: this binding was built with flatmem.h" "$out/mismatch.txt" &&
  grep -qF "the loaded libflatmem is 9.9.9 (flatmem_version() = 90909)" "$out/mismatch.txt" ||
  { cat "$out/mismatch.txt"; fail "no UnsatisfiedLinkError naming both versions"; }
echo "check-java: OK"
