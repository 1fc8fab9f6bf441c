#!/bin/sh
# Install the kit's wheel into an image, by its hash: used by every images/*/Dockerfile (bind-mounted with dist/,
# never copied into a layer). Arguments: PYTHON WHEEL_FILE_NAME SHA256. The wheel is the one `make dist` built; its
# SHA-256 is the one images/images.lock.json records for the image (`invoke images.build` passes both).
set -eu
python=$1 wheel=$2 sha=$3
if [ -z "$wheel" ] || [ -z "$sha" ]; then
    echo "error: KIT_WHEEL and KIT_WHEEL_SHA256 are empty: build with make image-NAME (make dist, then invoke images.build)" >&2
    exit 1
fi
if ! echo "$sha  /tmp/dist/$wheel" | sha256sum --check --status; then
    echo "error: dist/$wheel is missing or is not the wheel images/images.lock.json records (sha256 $sha): run make dist" >&2
    exit 1
fi
echo "draftscope @ file:///tmp/dist/$wheel --hash=sha256:$sha" > /tmp/kit-requirements.txt
"$python" -m pip install --no-deps --require-hashes -r /tmp/kit-requirements.txt
rm /tmp/kit-requirements.txt
