#!/bin/sh
# clean-remove.sh CODE_DIR KIND NAME STAMP...: `clusterctl clean --yes` removes exactly these
# items on this node, each checked again here, one line each: "removed KIND NAME KIB",
# "gone KIND NAME" (not there any more) or "kept KIND NAME WHY".
#   tree HEX MTIME   CODE_DIR/trees/HEX, a directory (not a link), still last used at MTIME
#   login NAME -     /tmp/NAME (clusterctl-mux.*), a directory of ours with no socket in it
#   image ID -       the image, by its ID, through the runtime ($REMOVE_IMAGE ID)
set -u
d=$1
shift
# shellcheck disable=SC2088 # a literal ~/ from the inventory, expanded here by hand
case $d in "~/"*) d=$HOME/${d#"~/"};; esac
t=
if [ -d "$d/trees" ] && cd -P -- "$d/trees" 2>/dev/null; then t=$(pwd -P); fi
while [ "$#" -ge 3 ]; do
  k=$1 n=$2 s=$3
  shift 3
  case $k in
    tree)
      case $n in *[!0-9a-f]*|'') echo "kept tree $n not a tree name"; continue ;; esac
      [ "${#n}" -eq 64 ] || { echo "kept tree $n not a tree name"; continue; }
      p=$t/$n
      if [ -z "$t" ] || { [ ! -e "$p" ] && [ ! -L "$p" ]; }; then echo "gone tree $n"; continue; fi
      if [ -L "$p" ] || [ ! -d "$p" ]; then echo "kept tree $n not a directory"; continue; fi
      [ "$(stat -c %Y -- "$p")" = "$s" ] || { echo "kept tree $n used since it was listed"; continue; }
      b=$(du -sk -- "$p" | cut -f1)
      if rm -rf -- "$p"; then echo "removed tree $n $b"; else echo "kept tree $n could not remove it"; fi ;;
    login)
      case $n in clusterctl-mux.*) ;; *) echo "kept login $n not a kept-login name"; continue ;; esac
      case $n in *[!A-Za-z0-9._-]*) echo "kept login $n not a kept-login name"; continue ;; esac
      p=/tmp/$n
      if [ ! -e "$p" ] && [ ! -L "$p" ]; then echo "gone login $n"; continue; fi
      if [ -L "$p" ] || [ ! -d "$p" ] || [ ! -O "$p" ]; then echo "kept login $n not a directory of ours"; continue; fi
      [ -z "$(find "$p" -type s 2>/dev/null | head -n 1)" ] || { echo "kept login $n a login is live in it"; continue; }
      b=$(du -sk -- "$p" | cut -f1)
      if rm -rf -- "$p"; then echo "removed login $n $b"; elif [ ! -e "$p" ]; then echo "gone login $n"; else echo "kept login $n could not remove it"; fi ;;
    image)
      case $n in sha256:*) ;; *) echo "kept image $n not an image ID"; continue ;; esac
      case ${n#sha256:} in *[!0-9a-f]*|'') echo "kept image $n not an image ID"; continue ;; esac
      # shellcheck disable=SC2086 # $REMOVE_IMAGE: the runtime's argv the head puts here, words on purpose
      if out=$($REMOVE_IMAGE "$n" 2>&1); then echo "removed image $n 0"
      else case $out in *"No such image"*|*"image not known"*) echo "gone image $n" ;;
        *) echo "kept image $n $(printf '%s' "$out" | tr '\n' ' ')" ;; esac; fi ;;
    *) echo "kept $k $n not a kind clean removes" ;;
  esac
done
exit 0
