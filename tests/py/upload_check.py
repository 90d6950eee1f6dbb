"""Check the GPU uploads of share_job.py --emu-cuda jobs that shared a loader.

Every job uploaded each training batch through the test device and read it
back ("dev": 1 when the device bytes equal the host bytes). What must hold:

  always            every batch's device bytes equal the host tensor the job
                    uploaded (a batch served from the producer's GPU ring is
                    exactly what the job would have uploaded itself); every
                    upload went one way: host-to-device plus device-to-device
                    bytes of a consumer equal the bytes it uploaded
  --expect served   nothing changed a batch: each consumer had uploads served
                    device to device (with --min-served F: at least the
                    fraction F of its batches wholly, "h2d": 0); the producer
                    uploaded all its batches from the host and kept them on
                    the device
  --expect producer-changed
                    the producer changed the images of each batch before
                    uploading them: no consumer got images from the GPU ring
                    (the unchanged labels may come from it)
  --expect consumer-changed
                    the consumers changed their images before uploading them:
                    none of those bytes came from the ring
  --expect takeover the producer was killed mid-epoch (its record is not
                    given): a job took over (role 2, then 1) and made the
                    rest of the stream's epoch, uploading it from the host;
                    the other consumers' uploads of it were served: of their
                    batches of that epoch uploaded after the takeover as
                    consumers, at least one, and at least half, came wholly
                    device to device ("h2d": 0). (Another job may take over
                    in turn when the successor has finished: the first to
                    take over is the successor.)

  --expect exit     the producer finished and exited while a consumer still
                    read: that consumer may have taken over afterwards (role
                    2, then 1); each consumer had at least one batch served
                    wholly device to device before.

Roles come from the records ("role" per batch: 1 producer, 2 consumer); a
job must hold one role throughout. Prints one line per job and a summary;
exit 0 when everything holds, 1 otherwise.
"""
import argparse
import json
import sys


def load(path):
    batches, gpu = [], None
    for line in open(path):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("loader") == "train" and "dev" in r:
            batches.append(r)
        if r.get("done"):
            gpu = r.get("gpu")
    return batches, gpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--expect", required=True,
                    choices=["served", "producer-changed", "consumer-changed", "takeover", "exit"])
    ap.add_argument("--min-served", type=float, default=0.0, metavar="F")
    ap.add_argument("records", nargs="+")
    a = ap.parse_args()
    if a.expect == "takeover":
        return takeover(a.records)
    if a.expect == "exit":
        return exited(a.records)
    bad = []
    producers = consumers = 0
    for path in a.records:
        batches, gpu = load(path)
        if not batches or gpu is None:
            bad.append("%s: no uploaded batches or no gpu counters" % path)
            continue
        roles = {b["role"] for b in batches}
        up = sum(b["up"] for b in batches)
        xb = sum(b["xb"] for b in batches)
        h2d, d2d = gpu["h2d_bytes"], gpu["d2d_bytes"] + gpu["peer_bytes"]
        wrong = sum(1 for b in batches if b["dev"] != 1)
        print("%s: role %s, %d batches, %d bytes uploaded: %d host-to-device, %d device-to-device%s"
              % (path, "/".join(str(r) for r in sorted(roles, key=str)), len(batches), up, h2d, d2d,
                 ", %d batches wrong on the device" % wrong if wrong else ""))
        if wrong:
            bad.append("%s: %d batches whose device bytes differ from the host's" % (path, wrong))
        if len(roles) != 1 or roles.pop() not in (1, 2):
            bad.append("%s: not one role throughout (%s)" % (path, sorted(roles, key=str)))
            continue
        if batches[0]["role"] == 1:
            producers += 1
            if h2d != up:
                bad.append("%s: the producer uploaded %d of its %d bytes from the host" % (path, h2d, up))
            if a.expect == "served" and d2d == 0:
                bad.append("%s: the producer kept nothing in its GPU ring" % path)
            continue
        consumers += 1
        if h2d + d2d != up:
            bad.append("%s: %d + %d bytes moved for %d uploaded" % (path, h2d, d2d, up))
        if a.expect == "served" and d2d == 0:
            bad.append("%s: a consumer with no upload served from the ring" % path)
        whole = sum(1 for b in batches if b["h2d"] == 0)
        print("%s: %d of %d batches served wholly device to device" % (path, whole, len(batches)))
        if a.expect == "served" and whole < a.min_served * len(batches):
            bad.append("%s: %d of %d batches served wholly device to device, below %g" %
                       (path, whole, len(batches), a.min_served))
        if a.expect == "producer-changed" and d2d > up - xb:
            bad.append("%s: %d bytes served from the ring, more than its %d label bytes: images the producer "
                       "changed were served" % (path, d2d, up - xb))
        if a.expect == "consumer-changed":
            if any(not b["mut"] for b in batches):
                bad.append("%s: a consumer batch was not changed (test set-up)" % path)
            if h2d < xb:
                bad.append("%s: only %d of its %d changed image bytes went from the host" % (path, h2d, xb))
    if producers != 1 or consumers < 1:
        bad.append("%d producers and %d consumers (one producer and consumers expected)" % (producers, consumers))
    for b in bad:
        print("FAIL: " + b)
    print("upload_check (%s): %s" % (a.expect, "OK" if not bad else "%d failures" % len(bad)))
    return 1 if bad else 0


def exited(records):
    bad, producers, consumers = [], 0, 0
    for path in records:
        batches, gpu = load(path)
        if not batches or gpu is None:
            bad.append("%s: no uploaded batches or no gpu counters" % path)
            continue
        wrong = sum(1 for b in batches if b["dev"] != 1)
        if wrong:
            bad.append("%s: %d batches whose device bytes differ from the host's" % (path, wrong))
        roles = "".join(str(b["role"]) for b in batches)
        if roles.strip("1") == "":
            producers += 1
            print("%s: producer, %d batches" % (path, len(batches)))
            continue
        consumers += 1
        k = roles.find("1")
        served = sum(1 for b in batches[:k if k >= 0 else len(batches)] if b["h2d"] == 0)
        print("%s: roles %s, %d batches served wholly device to device%s" %
              (path, roles, served, ", %d wrong on the device" % wrong if wrong else ""))
        if roles.rstrip("1").strip("2") != "":
            bad.append("%s: roles %s: not a consumer that took over at most once" % (path, roles))
        if served == 0:
            bad.append("%s: no batch served from the ring" % path)
    if producers != 1 or consumers < 1:
        bad.append("%d producers and %d consumers (one producer and consumers expected)" % (producers, consumers))
    for b in bad:
        print("FAIL: " + b)
    print("upload_check (exit): %s" % ("OK" if not bad else "%d failures" % len(bad)))
    return 1 if bad else 0


def takeover(records):
    bad, jobs, succ = [], {}, []
    for path in records:
        batches, gpu = load(path)
        if not batches or gpu is None:
            bad.append("%s: no uploaded batches or no gpu counters" % path)
            continue
        jobs[path] = batches
        wrong = sum(1 for b in batches if b["dev"] != 1)
        if wrong:
            bad.append("%s: %d batches whose device bytes differ from the host's" % (path, wrong))
        roles = [b["role"] for b in batches]
        if 1 in roles:
            k = roles.index(1)
            if k == 0 or any(r != 2 for r in roles[:k]) or any(r != 1 for r in roles[k:]):
                bad.append("%s: roles %s: not a consumer that took over once" % (path, "".join(map(str, roles))))
            succ.append((batches[k]["t"], path, batches[k]))
            host = [b for b in batches[k:] if b["h2d"] != b["up"]]
            if host:
                bad.append("%s: as producer, %d uploads not all from the host" % (path, len(host)))
    if not succ:
        bad.append("no job took over")
    else:
        _, spath, first = min(succ)
        print("%s took over at its batch %d (epoch %d)" % (spath, first["batch"], first["epoch"]))
        for path, batches in jobs.items():
            if path == spath:
                continue
            after = [b for b in batches if b["epoch"] == first["epoch"] and b["t"] > first["t"] and b["role"] == 2]
            served = sum(1 for b in after if b["h2d"] == 0)
            print("%s: %d of its %d batches uploaded after the takeover served device to device, "
                  "%d bytes from the host" % (path, served, len(after), sum(b["h2d"] for b in after)))
            if not after or 2 * served < len(after):
                bad.append("%s: %d of %d batches after the takeover served from the ring"
                           % (path, served, len(after)))
    for b in bad:
        print("FAIL: " + b)
    print("upload_check (takeover): %s" % ("OK" if not bad else "%d failures" % len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
