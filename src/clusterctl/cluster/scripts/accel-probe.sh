#!/bin/sh
# The accelerator probe of preflight (cluster/accelprobe.py): the raw output of each vendor
# tool the node has, in parts marked with the token $1; nothing is judged here (the head
# parses and judges), nothing is written.  A node with neither nvidia-smi nor cnmon nor a
# Cambricon device prints nothing.
t=$1
begin() { printf '%s part %s\n' "$t" "$1"; }
end() { printf '\n%s rc %s %s\n' "$t" "$1" "$2"; }
if command -v nvidia-smi >/dev/null 2>&1; then
  begin smi_xml; nvidia-smi -q -x 2>&1; end smi_xml $?
  begin smi_apps
  nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader 2>&1
  end smi_apps $?
  # the kernel's Xid lines (dmesg may be closed to users: then the journal's kernel part)
  begin xid
  { dmesg 2>/dev/null || journalctl -k -q --no-pager 2>/dev/null; } | grep 'NVRM: Xid' | tail -n 50
  end xid 0
  begin toolkit
  for c in nvidia-container-runtime-hook nvidia-container-toolkit nvidia-container-cli nvidia-ctk; do
    command -v "$c" || :
  done
  end toolkit 0
  if command -v nvidia-ctk >/dev/null 2>&1; then
    begin cdi_list; nvidia-ctk cdi list 2>&1; end cdi_list $?
  fi
  begin cdi_specs
  for f in /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/*.yaml /var/run/cdi/*.json; do
    [ -f "$f" ] || continue
    printf '== %s\n' "$f"
    head -c 262144 "$f"
    echo
  done
  end cdi_specs 0
  if command -v dcgmi >/dev/null 2>&1; then
    begin dcgm; dcgmi health -c 2>&1; end dcgm $?
  fi
fi
mlu=
for d in /dev/cambricon_*; do [ -e "$d" ] && mlu=1; done
if [ -n "$mlu" ] || command -v cnmon >/dev/null 2>&1; then
  begin mlu_devices
  for d in /dev/cambricon_*; do [ -e "$d" ] && printf '%s\n' "$d"; done
  end mlu_devices 0
  if command -v cnmon >/dev/null 2>&1; then
    begin cnmon_info; cnmon info 2>&1; end cnmon_info $?
  fi
fi
exit 0
