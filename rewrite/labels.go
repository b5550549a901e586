package rewrite

// Tables lists the labels of the protected tables (as configured), for messages that concern every one of
// them, such as an invalid token refused at the SET, before any write names a table.
func (r *Rewriter) Tables() []string {
	labels := make([]string, len(r.tables))
	for i, e := range r.tables {
		labels[i] = e.label
	}
	return labels
}

// Tables lists the labels of the protected tables of the cache's rewriter.
func (c *Cache) Tables() []string { return c.r.Tables() }
