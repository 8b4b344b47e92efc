#!/bin/bash
# Bundle hils + OpenMPI (Debian 12's openmpi-bin, as installed on the build machine) with every
# shared library they load, glibc and its loader included, into a relocatable folder R, for a
# machine with no MPI (README, "Measured on 16 cores"):
#   R/bin/{hils,mpirun}       wrappers: exec R/glibc/ld-linux-x86-64.so.2 --library-path
#                             R/glibc:R/lib... <real binary> (the host's own libraries unused)
#   R/libexec/{hils,orterun}  the real binaries
#   R/lib                     every needed .so but glibc's, flat. orterun puts <prefix>/lib on
#                             the ranks' LD_LIBRARY_PATH: glibc must not be there, or the
#                             host's /bin/sh (the wrapper) loads Debian's libc 2.36 and fails
#                             where it needs a newer one (Ubuntu 24.04: GLIBC_2.38 not found)
#   R/glibc                   ld-linux, libc, libm, libresolv
#   R/lib/x86_64-linux-gnu/{openmpi,pmix2}, R/share/openmpi: plugins and help files at /usr's
#   relative paths, for OPAL_PREFIX=R and the PMIX_* variables set by R/bin/mpirun.
# There: R/bin/mpirun --oversubscribe --bind-to none -n N R/bin/hils ..., with
#   OMPI_MCA_plm=isolated (one machine, no ssh) OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
#   OMPI_MCA_btl_vader_single_copy_mechanism=none (no cross-memory attach assumed in a sandbox).
# usage: scripts/bundle_openmpi.sh build/bin/hils R; tar -cJf bundle.tar.xz -C "$(dirname R)" ...
set -euo pipefail
hils=$1 R=$2
[ -e "$R" ] && { echo "bundle_openmpi.sh: $R exists; give a new folder" >&2; exit 2; }
mkdir -p "$R"/{bin,libexec,lib,glibc,etc}
cp -L "$hils" "$R/libexec/hils"
cp -L /usr/bin/orterun "$R/libexec/orterun"
ml=lib/x86_64-linux-gnu
mkdir -p "$R/$ml/openmpi/lib" "$R/share" "$R/$ml/pmix2/lib"
cp -a /usr/$ml/openmpi/lib/openmpi3 "$R/$ml/openmpi/lib/"
cp -a /usr/share/openmpi "$R/share/"
cp -a /usr/$ml/pmix2/lib/pmix "$R/$ml/pmix2/lib/" && cp -a /usr/$ml/pmix2/share "$R/$ml/pmix2/"
cp /etc/openmpi/openmpi-mca-params.conf "$R/etc/"
# Every library any ELF file here needs (ldd resolves recursively), copied flat.
find "$R" -type f \( -name '*.so*' -o -path '*/libexec/*' \) -print0 |
  xargs -0 -n1 ldd 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
  while read -r f; do cp -nL "$f" "$R/lib/"; done
cp -L /lib64/ld-linux-x86-64.so.2 "$R/glibc/"
for g in libc.so.6 libm.so.6 libresolv.so.2 libpthread.so.0 libdl.so.2 librt.so.1; do
  [ -f "$R/lib/$g" ] && mv "$R/lib/$g" "$R/glibc/"
done
cat > "$R/bin/hils" <<'W'
#!/bin/sh
d=${0%/*}; R=$(cd "$d/.." && pwd)
exec "$R/glibc/ld-linux-x86-64.so.2" --library-path "$R/glibc:$R/lib" "$R/libexec/hils" "$@"
W
cat > "$R/bin/mpirun" <<'W'
#!/bin/sh
d=${0%/*}; R=$(cd "$d/.." && pwd); P="$R/lib/x86_64-linux-gnu/pmix2"
export OPAL_PREFIX="$R" OPAL_SYSCONFDIR="$R/etc" PMIX_PREFIX="$P" PMIX_LIBDIR="$P/lib" \
  PMIX_PKGLIBDIR="$P/lib/pmix" PMIX_DATADIR="$P/share" PMIX_PKGDATADIR="$P/share/pmix" \
  PMIX_SYSCONFDIR="$P/share" PMIX_DATAROOTDIR="$P/share" PMIX_MCA_mca_base_component_path="$P/lib/pmix"
exec "$R/glibc/ld-linux-x86-64.so.2" --library-path "$R/glibc:$R/lib" "$R/libexec/orterun" "$@"
W
chmod +x "$R/bin/"*
du -sh "$R"
