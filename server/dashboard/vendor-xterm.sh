#!/bin/sh
# Copies the terminal the dashboard's console uses, xterm.js, from its npm package into
# assets/, where the binary embeds it (the page loads nothing from elsewhere). The version and
# the package's integrity are pinned: running this again writes the same files.
set -eu
version=6.0.0
integrity=sha512-TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg==
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "@xterm/xterm@$version" >/dev/null
tarball=xterm-xterm-$version.tgz
got="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
if [ "$got" != "$integrity" ]; then
	echo "vendor-xterm: $tarball has integrity $got, want $integrity" >&2
	exit 1
fi
tar xzf "$tarball"
# Without its source map, which the page does not serve.
sed '/^\/\/# sourceMappingURL=/d' package/lib/xterm.js >"$here/assets/xterm.js"
cp package/css/xterm.css "$here/assets/xterm.css"
cp package/LICENSE "$here/assets/xterm.LICENSE"
echo "vendor-xterm: @xterm/xterm $version in $here/assets"
