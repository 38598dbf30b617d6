#!/bin/sh
# Waits for the frontend, then creates the namespace the workers use (once).
set -eu
NAMESPACE="${DEFAULT_NAMESPACE:-default}"
ADDRESS="${TEMPORAL_ADDRESS:-temporal:7233}"

echo "waiting for Temporal at ${ADDRESS}"
tries=0
until temporal operator cluster health --address "$ADDRESS"; do
  tries=$((tries + 1))
  if [ "$tries" -ge 60 ]; then
    echo "Temporal at ${ADDRESS} is not healthy after ${tries} tries" >&2
    exit 1
  fi
  sleep 2
done
temporal operator namespace describe -n "$NAMESPACE" --address "$ADDRESS" \
  || temporal operator namespace create -n "$NAMESPACE" --retention 72h --address "$ADDRESS"
echo "namespace ${NAMESPACE} ready"
