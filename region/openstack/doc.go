// Package openstack is a region driver for an OpenStack cloud: servers are Nova servers, each
// with a Neutron port the driver makes for it on the network the catalogue names, and Glance
// holds the images they boot. The driver talks to the cloud through gophercloud with the
// credentials of a cloud in clouds.yaml, found where OpenStack's own tools look for it; one
// cloud project serves the whole region, and computeql's organizations and projects are told
// apart by what the driver writes on each server.
//
// # The catalogue's objects
//
// A catalogue flavor, image, network or security group of the region names the cloud's object
// by id or by name (looked up once, then kept; the cloud must have exactly one of the name), or
// is taken to have its catalogue id in the cloud. Check looks every one up, as a process does
// when it starts.
//
// # What a server carries
//
// Nova refuses '/' and ',' in tags (at most 50 tags of at most 60 characters) and metadata
// keys outside [a-zA-Z0-9-_:. ], so the spec is written like this:
//
//   - the reserved tag region.InstanceTag ("compute/instance-id") is the Nova tag
//     "instance-id=<value>", which FindServers looks servers up by (GET /servers?tags=…);
//   - the scope is the metadata compute:org, compute:project, compute:region and
//     compute:network, the instance tag is also compute:instance-id, and the catalogue's
//     flavor, image and SSH certificate authority are compute:flavor, compute:image and
//     compute:ssh-ca;
//   - the networking is compute:security-groups and compute:allowed-sources (catalogue ids
//     and CIDRs, comma-separated) and compute:public-ip ("true" or empty), enforced by
//     Neutron (below);
//   - every other tag is compute:tag:<key>, the key's bytes outside [a-zA-Z0-9-_] written as
//     '.' and two hex digits ("made/by" is compute:tag:made.2Fby);
//   - the server's description is "computeql <org>/<project>/<region>/<network> <instance
//     tag>": Nova forgets a server's metadata and tags once it is deleted but still lists its
//     description, so that a deletion reported by the watch says whose server it was.
//
// User data goes to Nova as it is, unless the spec has extra SSH keys or an SSH certificate
// authority, which Nova has no way to give a guest (it knows one key pair, the project's):
// then Nova is given a MIME multipart for cloud-init, the user's data as its first part,
// unchanged, and a #cloud-config of the driver's with ssh_authorized_keys and, for the
// authority, write_files of its key and an sshd drop-in trusting it (where a libvirt
// region's guests have them) and a runcmd that reloads sshd. Its Merge-Type header has
// cloud-init append to the user's own lists rather than replace them; a multipart larger
// than Nova takes is gzipped, which cloud-init undoes. The user data and the spec's SSH keys
// are read back from Redis, where the driver keeps them (as JSON, under a reference the
// metadata compute:large holds) before the server is made: Nova shows user data to admins
// only, by its default policy, and an SSH key is longer than a metadata value may be.
// DeleteServer deletes them with the server.
//
// # Networking
//
// The driver makes the server's Neutron port itself, before the server, with the cloud's
// security groups that the catalogue's groups name, and one more group of the server's own
// (computeql-allow-…) whose ingress rules are the allowed source addresses (any protocol,
// any port). UpdateNetworking changes the port's groups and that group's rules in place, then
// the metadata. DeleteServer deletes the server, then its port and its group.
//
// A public IP is a Neutron floating IP of the external network the region names
// (externalNetwork, by id or name, looked up once), on the server's port. It is made with the
// port, before the server, so that a floating-IP quota or a pool run out refuses the create
// (region.ErrNoCapacity) with nothing left behind. UpdateNetworking adds or releases it;
// DeleteServer releases it before the port, since Neutron would only disassociate it. The
// address is read from Neutron, not from Nova's cached addresses, which learn of it late.
// A region that names no external network refuses public IPs.
//
// # Watch
//
// The watch polls Nova's server list with changes-since rather than consuming Nova's versioned
// notifications from RabbitMQ: it needs no access to the cloud's message bus (which clouds
// rarely give their tenants), and a cursor that is one of Nova's own timestamps resumes after
// any reconnect or restart without a queue to keep. Nova's list includes deleted servers, and
// every change of a server (its states, its metadata) moves its updated time. Each poll asks
// for the changes since a few seconds before the cursor, since a change committed late may
// carry an earlier time than one already seen, and reports each (server, updated time) once
// per watch; a watch resumed at a cursor may report again what came just before it, which
// the contract allows. Some changes escape changes-since: Nova deletes a server that has not
// reached a compute cell yet without moving its updated time; a change committed late may
// carry a time older than the overlap; and a server back where it was within one second (a
// reboot over at once) shows the updated time and state it had. So the servers last listed in
// the middle of something (BUILD, a task such as rebooting or powering-off), and those a verb
// of this process acted on, are read one by one at each poll until they settle: one gone is
// reported deleted, one settled is reported (after a verb even in the state it had before).
//
// # Faults
//
// No connection to the cloud is region.ErrUnreachable; a 5xx or a 429 that outlasted its
// retries is region.ErrUnavailable; a quota exceeded (or a network out of addresses) is
// region.ErrNoCapacity and any other 4xx region.ErrRefused, each with the cloud's own
// message. A 429 is retried after the Retry-After the cloud asked for.
//
// # Snapshots
//
// A snapshot is Nova's createImage: Nova copies the server's disk into a new Glance image of
// the cloud project, CREATING while Glance's status is queued or saving, READY once active,
// FAILED when killed or deactivated. The image carries compute:region, compute:org and
// compute:project (Images lists a project's by filtering Glance on them), compute:source-image
// (the catalogue image it descends from, for its architecture, virtualization and OS) and
// compute:size-gib (its server's disk); its tags are kept in Redis under compute:large, as a
// server's user data. A server of the project can boot from a READY snapshot.
//
// # Console
//
// ConsoleOutput is Nova's console log. OpenConsole is Nova's remote console of protocol
// serial, a WebSocket of nova-serialproxy, whose binary messages the driver relays; a cloud
// whose computes have no serial console refuses it (region.ErrRefused, with Nova's reason).
//
// The project key pair is a Nova key pair whose private key computeql keeps in Redis.
package openstack
