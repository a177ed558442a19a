#!/bin/sh
# Rebuilds the seed ELF files in elf/ from src/: tiny freestanding binaries (no libc) covering
# DWARF 4 and 5, zlib (SHF_COMPRESSED and .zdebug_) and zstd sections, ELF32, C++ names, and a
# stripped shared library with .gnu_debuglink beside its --only-keep-debug file. The extract
# target starts from those too, and from extract/: what only its section plan treats apart, a
# relocatable object (SHT_REL(A), group and per-function sections) and a binary with a symbol
# table but no DWARF. The text seeds of selector/ and relabel/ are written by hand.
set -eu
cd "$(dirname "$0")"
src=src out=elf
mkdir -p "$out" extract
# No libc, no unwind tables, no page padding between segments: each file is 2-4 KB. The prefix
# map keeps this checkout's path out of DW_AT_comp_dir, so rebuilds are byte-identical.
lib="-nostdlib -fno-asynchronous-unwind-tables -ffile-prefix-map=$PWD=. -Wl,--build-id -Wl,-z,noseparate-code -Wl,-z,norelro"
f="-static $lib"
gcc -g -O1 $f "$src/work.c" -o "$out/dwarf5-O1"
gcc -gdwarf-4 -O2 $f "$src/work.c" -o "$out/dwarf4-O2"
gcc -g -O1 $f -gz=zlib "$src/work.c" -o "$out/dwarf5-zlib"
gcc -g -O1 $f -gz=zlib-gnu "$src/work.c" -o "$out/dwarf5-zdebug-gnu"
# gcc 12 has no -gz=zstd; binutils 2.40 compresses with zstd.
objcopy --compress-debug-sections=zstd "$out/dwarf5-O1" "$out/dwarf5-zstd"
sed 's/mov $60, %%eax; syscall/mov $1, %%eax; int $0x80/; s/"D"(r \& 1) : "rax", "rcx", "r11"/"b"(r \& 1) : "eax"/' \
    "$src/work.c" > "$out/.work32.c"
gcc -m32 -g -O1 $f "$out/.work32.c" -o "$out/elf32-dwarf5-O1"
rm "$out/.work32.c"
g++ -g -O1 -fno-exceptions -fno-rtti $f "$src/work.cpp" -o "$out/cpp-dwarf5-O1"
gcc -g -O1 -shared -fPIC $lib "$src/work.c" -o "$out/.lib.so"
objcopy --only-keep-debug "$out/.lib.so" "$out/lib-only-keep-debug.debug"
strip --strip-all "$out/.lib.so" -o "$out/lib-stripped-debuglink.so"
objcopy --add-gnu-debuglink="$out/lib-only-keep-debug.debug" "$out/lib-stripped-debuglink.so"
rm "$out/.lib.so"
gcc -g -O1 -c -ffunction-sections -fno-asynchronous-unwind-tables -ffile-prefix-map=$PWD=. \
    "$src/work.c" -o extract/relocatable-debug.o
gcc -O1 $f "$src/work.c" -o extract/.nodebug
strip --strip-debug extract/.nodebug -o extract/symtab-only
rm extract/.nodebug
