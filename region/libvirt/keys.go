package libvirt

// The driver's Redis keys. Every key of a region carries the region's id as its hash tag, so
// that on a Redis Cluster a region's keys live on one shard.

// sshKeyKey holds a project's SSH key pair (OpenSSH PEM), shared by every process.
func sshKeyKey(regionID, org, project string) string {
	return "libvirt:{" + regionID + "}:sshkey:" + org + "/" + project
}

// importLockKey is held (with a random token, for importLease) by the process importing an
// image's base volume into the region's pool.
func importLockKey(regionID, volume string) string {
	return "libvirt:{" + regionID + "}:import:" + volume
}

// imageReadyKey marks an imported base volume as whole: it exists once every byte is in the
// pool, and a base volume without it is never backed onto.
func imageReadyKey(regionID, volume string) string {
	return "libvirt:{" + regionID + "}:imported:" + volume
}
